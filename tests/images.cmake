# dpdata images: bad files, --strict, the validation split and thread-count independence on
# trees tests/images_tree.py writes with PIL (test_images); class order, sample order and pixels
# against torchvision's ImageFolder and PIL (images_torchvision, skipped without torchvision).
dpt_add_cli_test(test_images TIMEOUT 300)
add_test(NAME images_torchvision
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/images_torchvision_check.py
                 --dpdata $<TARGET_FILE:dpdata>)
set_tests_properties(images_torchvision PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
# dpdata images --store jpeg: pixels within JPEG's loss of the raw import, thread-count
# independence, every reader (all, shard, stream, JpegRows) alike bit for bit, damaged rows and
# offsets named, option errors (test_images_jpeg; skipped without PIL).
dpt_add_cli_test(test_images_jpeg TIMEOUT 300)
