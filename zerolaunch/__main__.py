from zerolaunch.cli.app import main

main()
