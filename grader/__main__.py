from grader.resident import main

main()
