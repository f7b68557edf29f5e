"""The management routes' facades, one per capability: ModelManagement, SteeringManagement,
BaseManagement, FeatureManagement, CalibrationManagement, MonitorManagement,
ProbeManagement. Each presents the lower tier's state to the API. Upper tier."""
