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
