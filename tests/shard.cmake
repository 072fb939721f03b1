dpt_add_test(test_shard RANKS 4 TIMEOUT 300)
