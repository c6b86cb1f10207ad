"""Word frequencies."""
