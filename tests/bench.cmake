# bench-scaling: the harness on 4 CPU ranks, and the executable end to end (1 and 2 ranks).
dpt_add_test(test_bench RANKS 4 TIMEOUT 300)
target_link_libraries(test_bench PRIVATE dpt_scaling)
dpt_add_cli_test(test_bench_cli TIMEOUT 600)
dpt_add_test(test_bench_tta TIMEOUT 60)
target_link_libraries(test_bench_tta PRIVATE dpt_scaling)
