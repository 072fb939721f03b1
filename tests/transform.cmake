# Resized crops against torchvision: random_resized_crop's window distribution (area and aspect
# ratio, two-sample Kolmogorov-Smirnov distance to torchvision's get_params), the resize of a
# window (F.resized_crop with antialias=True, then hflip and Normalize, max abs diff <= 2e-6)
# and evaluation's Resize + CenterCrop. Needs python3-torchvision; skips (exit 77) without it.
add_executable(transform_probe transform_probe.cpp)
target_link_libraries(transform_probe PRIVATE dpt)
add_test(NAME torch_transform
         COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/torch_transform_check.py
                 --probe $<TARGET_FILE:transform_probe>
         WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(torch_transform PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)

# dptrain --predict on an image tree against --eval on its import (top-1 agreement exact), 1 and
# 2 ranks alike, a corrupt file reported in its row, bad invocations exit 2. Needs PIL.
add_test(NAME predict
         COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/predict_check.py
                 --build ${CMAKE_BINARY_DIR} --root ${CMAKE_SOURCE_DIR}
         WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(predict PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77 PROCESSORS 2)
