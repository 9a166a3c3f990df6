"""Several sites, one control plane: farm actions carried to another farmhost over MQTT (docs/mqtt.md)."""
