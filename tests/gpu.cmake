# CUDA backend and NCCL transport tests; they skip where no GPU is visible.
dpt_add_test(test_gpu RANKS 1 TIMEOUT 300)
# bf16's derived copies (weight shadow, activation copies) and the fused MLP path.
dpt_add_test(test_gpu_bf16 RANKS 1 TIMEOUT 300)
# NCCL against MPI on 2 ranks (needs 2 GPUs), and the refusal of 2 ranks on 1 GPU (needs 1).
dpt_add_test(test_gpu_nccl RANKS 2 TIMEOUT 120)
# Where no GPU is visible every case skips: report the tests as skipped, not passed.
# The convolutional-network ops (im2col/col2im, pooling, activations, layouts, dropout,
# augmentation, convolutions in fp32/tf32/bf16) against the CPU backend.
dpt_add_test(test_gpu_conv RANKS 1 TIMEOUT 300)
# The residual-network ops (batch norm, global and padded pooling, label-smoothed cross-entropy)
# against the CPU backend.
dpt_add_test(test_gpu_resnet RANKS 1 TIMEOUT 300)
# The residual sum and its gradient stream (bf16 copies, the kept gradient, the deferred batch
# norm), against the CPU backend and the unfused path.
dpt_add_test(test_gpu_residual RANKS 1 TIMEOUT 300)
set_tests_properties(test_gpu test_gpu_bf16 test_gpu_nccl test_gpu_conv test_gpu_resnet test_gpu_residual
                     PROPERTIES SKIP_REGULAR_EXPRESSION "no CUDA device visible")
# Whole training runs, cuda against cpu: 1 rank (graph-captured step), and 2 ranks sharing
# the GPUs over MPI where there are fewer GPUs than ranks (or NCCL with one GPU each).
dpt_add_test(test_gpu_train RANKS 1 TIMEOUT 300)
set_tests_properties(test_gpu_train PROPERTIES SKIP_REGULAR_EXPRESSION "no CUDA device visible")
# Convolutional layer lists trained on the GPU against the CPU backend (fp32, TF32, bf16).
dpt_add_test(test_gpu_train_cnn RANKS 1 TIMEOUT 300)
set_tests_properties(test_gpu_train_cnn PROPERTIES SKIP_REGULAR_EXPRESSION "no CUDA device visible")
