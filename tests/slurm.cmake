# jobs/*.sbatch submitted to a real single-node Slurm that the test starts and stops itself
# (tests/slurm/cluster.sh); skipped, saying why, without root or without slurm-wlm and munge.
# Jobs wait for a free node in turn, and a requeued job waits cred_expire (5 s) to start again.
dpt_add_cli_test(test_slurm TIMEOUT 480)
set_tests_properties(test_slurm PROPERTIES RUN_SERIAL TRUE)
