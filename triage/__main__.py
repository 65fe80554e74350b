from triage.cli import main

main()
