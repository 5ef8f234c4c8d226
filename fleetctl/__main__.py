from fleetctl.cli import main

main()
