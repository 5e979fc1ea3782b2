"""The adaptive reminder service: model, schedules, tables, service, management."""
