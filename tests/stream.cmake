# data.read = stream's memory bound, measured: peak resident memory of one CPU rank training an
# epoch of a 300 MB file streamed, and of a 136 MB file of JPEG rows (300 MB decoded), stays
# within 48 MiB of a run on a 3 MB file, where data.read = all and shard hold the file (>= 250 MiB
# over it); and the JPEG stream's hint to unbind a rank pinned to fewer than 4 cores. Needs h5py,
# numpy and PIL; skips (exit 77) without them. About 20 s.
add_test(NAME stream_memory
         COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/stream_memory_check.py
                 --build ${CMAKE_BINARY_DIR} --root ${CMAKE_SOURCE_DIR}
         WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(stream_memory PROPERTIES
  TIMEOUT 180
  SKIP_RETURN_CODE 77
  ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
