# Users' own arrays: dpdata npy and dpdata csv on good and broken files, and training on what
# they write. Reads class_names with the raw HDF5 API, so it needs the headers.
dpt_add_cli_test(test_import TIMEOUT 300)
target_include_directories(test_import PRIVATE ${HDF5_C_INCLUDE_DIRS})
