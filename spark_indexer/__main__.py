from spark_indexer.cli import main

main()
