# Batch norm, residual blocks and the ResNet presets: parsing, shapes, the CPU ops, gradients.
dpt_add_test(test_resnet RANKS 1 TIMEOUT 300)
