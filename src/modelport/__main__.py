from modelport.cli import main

main()
