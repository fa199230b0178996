"""The DP-agnostic training loop (``loop``): ``run_loop``, its gradient steps, summed objectives
and the checked resume state."""
