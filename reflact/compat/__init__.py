"""Drop-in entry points for other tools' pipelines (reflact.compat.skillopt for SkillOpt)."""
