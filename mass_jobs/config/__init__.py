"""Typed shapes of what a user writes, with nothing below them: the run spec's models (`run_spec`,
source of schemas/run-spec.schema.json), a task and a workflow (`task_spec`), what every model shares
(`shared`: closed objects, id and URL shapes, budget bounds), the teacher-composition presets
(`composition`) and the errors the CLI maps to exit codes (`errors`). Pure data: every other package
may import it; it imports none of theirs."""
