from cronlock.cli import main

main()
