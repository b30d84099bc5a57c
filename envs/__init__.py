"""Environments: task specs and catalog, the episode protocol, the worker pool, MiniWoB++ in
Chromium and Android over uiautomator2, and the rollouts stage."""
