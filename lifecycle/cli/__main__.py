from sandgate.lifecycle.cli import main

main()
