dpt_add_test(test_core RANKS 1 TIMEOUT 120)
