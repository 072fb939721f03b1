# Checkpoint tests. test_ckpt also writes ${CMAKE_BINARY_DIR}/test-ckpt-sample.h5 (fixture
# ckpt_sample), which test_ckpt_h5py then reads with h5py: an independent reader of the format.
dpt_add_test(test_ckpt RANKS 1 TIMEOUT 120)
set_tests_properties(test_ckpt PROPERTIES FIXTURES_SETUP ckpt_sample)

add_test(NAME test_ckpt_h5py
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/ckpt_h5py_check.py
                 ${CMAKE_BINARY_DIR}/test-ckpt-sample.h5)
set_tests_properties(test_ckpt_h5py PROPERTIES FIXTURES_REQUIRED ckpt_sample TIMEOUT 60)

# The test edits files with the raw HDF5 API (bit flips, foreign files), so it needs the headers.
target_include_directories(test_ckpt PRIVATE ${HDF5_C_INCLUDE_DIRS})
