"""What the evaluate stage computes from generated text: the task metric (metrics) and the
degeneracy checks (output_checks). Only the evaluate stage imports it."""
