"""Pieces shared by the algorithms: models, generation, cold start, evaluation, schedules."""
