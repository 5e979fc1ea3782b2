"""Generated from orleanspy/messaging/protos by orleanspy.messaging.protogen; do not edit."""
