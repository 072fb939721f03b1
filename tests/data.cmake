# Data layer: HDF5 layout, malformed-file corpus, idx import, generators.
dpt_add_test(test_data RANKS 1 TIMEOUT 120)
# Data order and sharding, reading given rows of a file, TrainRows (data.read = shard).
dpt_add_test(test_data_order RANKS 1 TIMEOUT 120)
