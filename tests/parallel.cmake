dpt_add_test(test_parallel RANKS 4 TIMEOUT 300)
dpt_add_test(test_parallel_cnn RANKS 4 TIMEOUT 300)
dpt_add_test(test_parallel_resnet RANKS 4 TIMEOUT 600)
