"""AutoSteer (/api/autosteer, docs/autosteer.md): a search over features and strengths that
moves the model towards a goal, judged by its own unsteered answers."""
