"""The RolloutJob API model: the single source of truth for manifests, the CRD and validation."""
