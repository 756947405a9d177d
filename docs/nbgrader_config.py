# nbgrader configuration for a course built on this workbook: copy it into your course directory
# (see docs/teaching.md, "With nbgrader") and set your course id.
c = get_config()  # noqa: F821 (nbgrader provides get_config)
c.CourseDirectory.course_id = "parallelism"

# The stub `./workbook student` writes, so that both routes hand out the same notebook: the answer
# cell runs (its variable stays None) and the locked check after it says "not answered yet" with a
# hint. nbgrader's default stub adds `raise NotImplementedError()`, which stops the notebook one
# cell earlier with a bare error.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\n"}

# Per-cell time limit of autograde (nbgrader's default, 30 s, is too short: 12.4.2's Llama 3 405B
# fake-world cell took 26-30 s under autograde on a 2-core machine and timed out in 3 of 6 runs).
# The slowest cell measured here is under 60 s even beside a loaded test suite; 300 s leaves a
# five-fold margin for slower machines. A cell still running then is interrupted and scores 0.
c.Execute.timeout = 300
