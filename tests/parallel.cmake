dpt_add_test(test_parallel RANKS 4 TIMEOUT 300)
