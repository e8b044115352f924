"""Taking the numbers: the correctness gate, the timers and the measurement engine, the integrity checks,
the device's fingerprint and peaks. Never decides a verdict and never writes a file."""
