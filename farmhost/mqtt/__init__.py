"""farmhost on MQTT: the broker link, farmhost as a device in Home Assistant (discovery), its commands."""
