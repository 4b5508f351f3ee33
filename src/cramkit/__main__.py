"""`python -m cramkit` (also what `torchrun -m cramkit` runs)."""

from cramkit.cli import entry

if __name__ == "__main__":
    entry()
