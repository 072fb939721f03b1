# Fault tests: real `mpirun ./dptrain` jobs with a rank killed, stalled or failing, signals,
# kill -9 and resume (bitwise against an uninterrupted run), 2 -> 4 -> 1 ranks, injected NaN, and
# a corpus of malformed configs. Each run is bounded by timeout(1) inside the test as well.
dpt_add_cli_test(test_faults TIMEOUT 480)
