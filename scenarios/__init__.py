"""Scenario files and the runner that builds a world, runs clients and collects results."""
