dpt_add_test(test_comm RANKS 4 TIMEOUT 60)
