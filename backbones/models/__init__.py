"""The model families (one file each), their shared base class, heads and attention recording."""
