# Data layer: HDF5 layout, malformed-file corpus, data order, idx import, generators.
dpt_add_test(test_data RANKS 1 TIMEOUT 120)
