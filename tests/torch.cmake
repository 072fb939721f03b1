# Cross-check against PyTorch: dptrain (1 and 2 ranks, every optimizer (LARS and LAMB against
# references written in torch in the script) and activation, accumulation, uint8 and float32
# data, a cosine schedule; convolutional layer lists with pooling, dropout and augmentation)
# replayed step by step in torch;
# per-step losses, learning rates, final parameters and optimizer state must agree.
# Needs /usr/bin/python3 with torch, h5py and numpy (Debian's python3-torch); skips (exit 77)
# without them. Takes a few seconds.
add_test(NAME torch_crosscheck
         COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/torch_crosscheck.py
                 --build ${CMAKE_BINARY_DIR} --root ${CMAKE_SOURCE_DIR}
         WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(torch_crosscheck PROPERTIES
  TIMEOUT 300
  SKIP_RETURN_CODE 77
  PROCESSORS 2
  ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")

# Cross-check against torchvision: resnet18(stem=small) on 1, 2 ranks, model.sync_bn both ways,
# accumulation, no weight decay on bn and biases with label smoothing; the step-0 checkpoint
# loaded strictly into torchvision's model, every tensor compared. Needs python3-torchvision;
# skips (exit 77) without it. Takes about a minute on 2 cores.
add_test(NAME torch_resnet_crosscheck
         COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/torch_resnet_crosscheck.py
                 --build ${CMAKE_BINARY_DIR} --root ${CMAKE_SOURCE_DIR}
         WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(torch_resnet_crosscheck PROPERTIES
  TIMEOUT 600
  SKIP_RETURN_CODE 77
  PROCESSORS 2
  ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")

# Weights in and out against torchvision: a resnet18(stem=small) state_dict moved by a few SGD
# steps, converted with scripts/torch_to_h5.py and written as .safetensors, evaluated by
# `dptrain --eval` on 1 and 2 ranks (test loss within 1e-5 of torchvision's eval mode); the round
# trip dptrain -> scripts/h5_to_torch.py (strict load) -> dptrain bitwise; a new head for
# another number of classes; a frozen body against the same run with every backward pass kept.
# Skips (exit 77) without torchvision. About 45 s on 2 cores.
add_test(NAME torch_finetune
         COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/torch_finetune_check.py
                 --build ${CMAKE_BINARY_DIR} --root ${CMAKE_SOURCE_DIR}
         WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(torch_finetune PROPERTIES
  TIMEOUT 300
  SKIP_RETURN_CODE 77
  PROCESSORS 2
  ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
