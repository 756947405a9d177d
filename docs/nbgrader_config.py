# nbgrader configuration for a course built on this workbook: copy it into your course directory
# (see docs/teaching.md, "With nbgrader") and set your course id.
c = get_config()  # noqa: F821 (nbgrader provides get_config)
c.CourseDirectory.course_id = "parallelism"

# The stub `./workbook student` writes, so that both routes hand out the same notebook: the answer
# cell runs (its variable stays None) and the locked check after it says "not answered yet" with a
# hint. nbgrader's default stub adds `raise NotImplementedError()`, which stops the notebook one
# cell earlier with a bare error.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\n"}
