dpt_add_cli_test(test_cli TIMEOUT 300)
