"""The federation front door: one OpenAI endpoint over several wattwise apps (clouds),
placing each request by Mico's rule (app.cloud_dispatch) and carrying it over failures."""
