dpt_add_cli_test(test_cli TIMEOUT 300)
dpt_add_cli_test(test_run_folder TIMEOUT 300)
dpt_add_cli_test(test_resume TIMEOUT 400)
dpt_add_cli_test(test_cli_edges TIMEOUT 300)
