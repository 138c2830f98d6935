"""The CPU auto-scheduler: ``schedule.autoschedule`` and the loop rewrites only it uses."""
