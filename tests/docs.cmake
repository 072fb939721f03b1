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
