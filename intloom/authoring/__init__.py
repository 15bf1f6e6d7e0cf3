"""The authoring API: what users import to write Workflows."""
