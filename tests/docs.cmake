# docs/configuration.md names every key `dptrain --help` lists, with its default, and no other
# (tests/docs/config_keys.cmake says exactly what is checked). No MPI launcher: --help exits
# before any collective.
add_test(NAME docs_config_keys
         COMMAND ${CMAKE_COMMAND} -DDPTRAIN=$<TARGET_FILE:dptrain>
                 -DDOC=${CMAKE_SOURCE_DIR}/docs/configuration.md
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/docs/config_keys.cmake)
set_tests_properties(docs_config_keys PROPERTIES
  TIMEOUT 60
  ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")

# Every figure README.md quotes (ratios, img/s, samples/s, ms, s, MiB, %, the sample output's
# accuracy lines) is on the bench/results page that its row or paragraph links to, and altering
# any place's first figure makes the check fail (tests/docs/readme_figures.py says exactly what
# is checked).
add_test(NAME docs_readme_figures
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/docs/readme_figures.py
                 ${CMAKE_SOURCE_DIR}/README.md)
set_tests_properties(docs_readme_figures PROPERTIES TIMEOUT 60)

# docs/formats.md's Python examples run as written: the h5py one writes a file dpdata accepts,
# and the torchvision one loads a resnet18(stem=small) checkpoint strictly. Needs python3-h5py
# and python3-torchvision; skips (exit 77) without them. About 10 s.
add_test(NAME docs_formats_snippets
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/docs/formats_snippets.py
                 --build ${CMAKE_BINARY_DIR} --doc ${CMAKE_SOURCE_DIR}/docs/formats.md)
set_tests_properties(docs_formats_snippets PROPERTIES
  TIMEOUT 120
  SKIP_RETURN_CODE 77
  ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
