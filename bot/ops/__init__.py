"""Operations: preflight checks, doctor, status file, backups, systemd notification."""
