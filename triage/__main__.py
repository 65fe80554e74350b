"""`python -m triage`: the command line."""

from triage.cli import main

main()
