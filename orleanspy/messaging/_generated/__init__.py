"""Generated from protos/orleanspy/v1 by orleanspy.messaging.protogen; do not edit."""
