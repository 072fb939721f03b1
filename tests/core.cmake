dpt_add_test(test_core RANKS 1 TIMEOUT 120)
# The layer list, shape inference, and the CPU backend's convolutional-network ops.
dpt_add_test(test_layers RANKS 1 TIMEOUT 120)
