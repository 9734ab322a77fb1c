"""Emulated regions: regions data, address plan, Mininet builder, impairment, calibration."""
