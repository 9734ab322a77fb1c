"""Link impairment (delay, jitter, loss, rate) behind one interface, two backends: netem where
the kernel has it, a userspace NFQUEUE engine where it does not."""
